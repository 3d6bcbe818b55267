"""The OpInfo sweep's tables (op_coverage.py): the entries it does not run and the entries it
runs with a stated allowance (tolerances, layouts, undefined values), each with its reason."""

from __future__ import annotations

# --- entries the sweep does not run, each with its reason ----------------------------------------
_CUDA = "CUDA-only op: no CPU samples"
_SPARSE = "sparse layouts: lazyxla tensors are dense"
SKIPS: dict[str, str] = {
    **{
        k: _CUDA
        for k in (
            "jiterator_unary",
            "jiterator_binary",
            "jiterator_binary_return_by_ref",
            "jiterator_4inputs_with_extra_args",
            "jiterator_2inputs_2outputs",
            "torch._scaled_mm",
            "torch._scaled_mm_v2",
            "torch.ops.aten._flash_attention_forward",
            "torch.ops.aten._efficient_attention_forward",
        )
    },
    "nn.functional.batch_norm.without_cudnn": "a CUDA variant (cuDNN off): no sample runs on CPU",
    **{k: _SPARSE for k in ("sparse.mm.reduce", "sparse.sampled_addmm", "to_sparse")},
    "chalf": "complex32 (chalf) has no XLA dtype",
    "hash_tensor": "uint64 output: torch has no uint64 arithmetic to compare with on the device",
}

# Gradient checks not run for an entry whose forward is checked.
GRAD_SKIPS: dict[str, str] = {}

# Entries whose values are not defined (uninitialized memory) or random: only shapes and dtypes are
# compared (and that the op ran natively).
_RANDOM = "random values (the device RNG is not PyTorch's CPU generator)"
_EMPTY = "uninitialized memory"
UNDEFINED_VALUES: dict[str, str] = {
    **{
        k: _RANDOM
        for k in (
            "bernoulli",
            "cauchy",
            "exponential",
            "geometric",
            "log_normal",
            "multinomial",
            "normal",
            "normal.in_place",
            "normal.number_mean",
            "rand_like",
            "randint",
            "randint_like",
            "randn",
            "randn_like",
            "uniform",
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.alpha_dropout",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.feature_alpha_dropout.without_train",
            "nn.functional.rrelu",
            "nn.functional.fractional_max_pool2d",
            "nn.functional.fractional_max_pool3d",
            "nn.functional.multi_head_attention_forward",
            "nn.functional.scaled_dot_product_attention",
            "svd_lowrank",
            "pca_lowrank",
        )
    },
    **{
        k: _EMPTY
        for k in (
            "empty",
            "empty_like",
            "new_empty",
            "new_empty_strided",
            "empty_strided",
            "empty_permuted",
        )
    },
}

# Entries whose outputs' strides differ from eager's, recorded lazily and compiled alike (their
# values are compared as every entry's are; every other entry's dense outputs keep eager's
# strides, `compare_layouts`).
_COLUMN_MAJOR = (
    "LAPACK's column-major result; the op has no meta kernel to read eager's strides from"
)
LAYOUT_DIFFERS: dict[str, str] = {
    "geqrf": _COLUMN_MAJOR,
    "linalg.lstsq": _COLUMN_MAJOR,
    "linalg.lstsq.grad_oriented": _COLUMN_MAJOR,
}

# Arguments that must stay on the CPU (the op requires it).
KEEP_CPU_ARGS = {"tensor_split"}

# Per-entry tolerances looser than torch.testing.assert_close's float32 defaults, with the reason.
TOLERANCES: dict[str, tuple[dict[str, float], str]] = {
    "matrix_exp": (
        {"rtol": 1e-5, "atol": 5e-2},
        "entries ~1e4: PyTorch's float32 Pade loses digits that lazyxla's float64 one keeps",
    ),
    "addbmm": ({"rtol": 1e-5, "atol": 1e-4}, "a sum of matmuls: accumulation order"),
    **{
        k: ({"rtol": 1e-5, "atol": 1e-4}, "gradient through 1/(s_i^2 - s_j^2)")
        for k in ("svd", "linalg.svd")
    },
    **{
        k: ({"rtol": 1e-5, "atol": 1e-4}, "gradient through a pseudo-inverse: LAPACK's vs XLA's")
        for k in ("linalg.lstsq", "linalg.lstsq.grad_oriented")
    },
    "linalg.householder_product": (
        {"rtol": 2e-5, "atol": 1e-3},
        "gradients ~1e2 through a product of reflectors: both ~2e-5 relative off float64",
    ),
    **{
        k: (
            {"rtol": 1e-5, "atol": 1e-4},
            "bicubic: gradients up to ~60 summed over 16 taps in another order",
        )
        for k in ("grid_sampler_2d", "nn.functional.grid_sample")
    },
    "cov": (
        {"rtol": 1e-5, "atol": 1e-4},
        "weighted samples: sum(w) - sum(w^2)/sum(w) cancels, its gradient more so",
    ),
    **{
        k: (
            {"rtol": 1e-5, "atol": 5e-4},
            "outputs up to ~1e3 summed from hundreds of products: XLA's convolution algorithm "
            "rounds a few elements ~1e-6 worse than oneDNN's",
        )
        for k in (
            "nn.functional.conv1d",
            "nn.functional.conv2d",
            "nn.functional.conv3d",
            "nn.functional.conv_transpose1d",
            "nn.functional.conv_transpose2d",
            "nn.functional.conv_transpose3d",
        )
    },
    "asin": ({"rtol": 1e-5, "atol": 1e-5}, "gradient 1/sqrt(1-x^2) near |x|=1 amplifies 1 ulp"),
    "erfinv": ({"rtol": 1e-5, "atol": 1e-5}, "gradient near |x|=1 amplifies 1 ulp"),
    "digamma": ({"rtol": 1e-4, "atol": 1e-5}, "gradient (trigamma) near the poles of negative x"),
    "logcumsumexp": (
        {"rtol": 5e-3, "atol": 1e-5},
        "samples at +-1e4: the backward formula's exp(x - out) amplifies float32 rounding",
    ),
    **{
        k: (
            {"rtol": 1e-4, "atol": 1e-5},
            "negative x near poles: recurrence vs reflection rounding",
        )
        for k in (
            "polygamma.polygamma_n_0",
            "polygamma.polygamma_n_1",
            "polygamma.polygamma_n_2",
            "polygamma.polygamma_n_3",
            "polygamma.polygamma_n_4",
            "special.polygamma.special_polygamma_n_0",
        )
    },
}

# uint8 image resamples: how far (in units) a value may be from eager's, with the reason. Eager's
# uint8 kernels weigh in 16-bit fixed point, and which kernel runs depends on the CPU (the AVX2
# one rounds the weights, the generic one truncates them), so no result is bit-equal on every
# x86-64 machine; lazyxla weighs in float32 and rounds each pass as they do
# (Note [Resampling uint8]).
_UINT8_RESAMPLE = "eager weighs in 16-bit fixed point, rounding per CPU kernel (AVX2 or generic)"
UINT8_TOLERANCES: dict[str, tuple[int, str]] = {
    "nn.functional.interpolate.bilinear": (1, _UINT8_RESAMPLE),
    "nn.functional.upsample_bilinear": (1, _UINT8_RESAMPLE),
    "_upsample_bilinear2d_aa": (1, _UINT8_RESAMPLE),
    "nn.functional.interpolate.bicubic": (2, _UINT8_RESAMPLE),
}

# Entries whose outputs are defined up to a sign (real) or a phase (complex) per column
# (eigenvectors): columns are normalized (largest-magnitude entry real positive) on both sides
# before comparing.
SIGN_FREE = {"linalg.eigh": 1, "eigh": 1, "linalg.eig": 1}
