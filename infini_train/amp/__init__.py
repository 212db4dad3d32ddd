"""Mixed precision: autocast (re-exported from infini_train.autograd.autocast) and the GradScaler."""
from ..autograd.autocast import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402
from .grad_scaler import GradScaler
