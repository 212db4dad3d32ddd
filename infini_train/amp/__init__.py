"""Mixed precision: autocast (re-exported from infini_train.autograd.autocast) and the GradScaler."""
from .grad_scaler import GradScaler
