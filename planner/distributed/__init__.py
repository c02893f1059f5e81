"""What `plan profile` and `plan run` share to run on real hardware: a torchrun-style
launcher (launch.py) and the GPT/Llama-style reference model (reference_model.py). Both
import torch lazily or only here, never from the planning code."""
