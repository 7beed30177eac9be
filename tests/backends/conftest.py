"""Backend tests: pick the Triton execution mode before any test module can import Triton.

Triton reads ``TRITON_INTERPRET`` when it is first imported; ``lumc.backends.triton`` sets it to 1
when no GPU is present, which must happen before anything else (torch.compile, say) imports Triton.
"""
import lumc.backends.triton  # noqa: F401
