"""Fused GPU kernels (Triton, optional: the ``gpu`` extra). Each module imports without triton and says through
``available`` whether its kernel can run."""
