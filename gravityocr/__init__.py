"""GravityOCR.

Importing the package asks Intel MKL for strict conditional numerical reproducibility
(`MKL_CBWR=AUTO,STRICT`) unless the environment already says otherwise: on some CPUs (AMD
EPYC) MKL's results otherwise depend on how its buffers happen to be aligned, so equal
inputs could give results a rounding apart, and a training run resumed from its checkpoint
would drift from the run that went straight through. MKL reads the setting when it first
runs, so the package is imported before anything computes (the CLI's entry point is in it).
"""

import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
