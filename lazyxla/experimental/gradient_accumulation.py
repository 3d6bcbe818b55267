"""torch_xla's `torch_xla.experimental.gradient_accumulation`: `gradient_accumulation(train_step,
iterable_tensors, model, *carried_tensors)` as one loop node (Note [Gradient accumulation loop])."""

from lazyxla._src.gradient_accumulation import (
    GradientAccumulationContext as GradientAccumulationContext,
)
from lazyxla._src.gradient_accumulation import gradient_accumulation as gradient_accumulation

__all__ = ["GradientAccumulationContext", "gradient_accumulation"]
