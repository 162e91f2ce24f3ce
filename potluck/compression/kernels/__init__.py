"""Fast paths: ``cpu`` (eager or torch.compile'd fused torch code) and ``triton_kernels`` (GPU, and the
Triton interpreter in tests). The torch reference in quantize.py / sparsify.py defines the bits."""
