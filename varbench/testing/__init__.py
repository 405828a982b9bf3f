"""Dev tools, not the mechanism: tiny random runtimes for CPU tests (`tiny`), the fake-CUDA dry run
(`fake_cuda`), the job config a command line composes (`jobs`).

Nothing in the package's production layers imports this package (the layer test checks it); tests,
`experiments/` and the CLI's dry run do. `from varbench.testing import tiny_runtime` (the 0.1 spelling)
keeps working: the tiny runtimes are re-exported here.
"""
from varbench.testing.tiny import cpu_fingerprint, perturb_, strict_parity, tiny_hart_runtime, tiny_runtime

__all__ = ["cpu_fingerprint", "perturb_", "strict_parity", "tiny_hart_runtime", "tiny_runtime"]
