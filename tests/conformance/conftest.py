"""The onnx node-case generators warn (overflow, divide by zero) while building expected outputs at
collection time; those warnings are about onnx's own numpy, not lumc."""
import warnings

warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"onnx\.backend\.test\..*")
