"""Draws docs/figures/getting-started/loss.png, the loss curve of the getting-started page, from a run's metrics with
the plot the run itself writes to out_dir/loss.png:

    mpirun -n 2 python examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml
    python docs/figures/getting-started/draw_loss_curve.py runs/gpt2_tiny_ddp/metrics.jsonl
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from infini_train.training.metrics import plot_loss_curve  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    metrics = argv[0] if argv else "runs/gpt2_tiny_ddp/metrics.jsonl"
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "loss.png")
    if not plot_loss_curve(metrics, out):
        sys.exit("draw_loss_curve: matplotlib is not installed (pip install -e '.[plot]')")
    print(out)


if __name__ == "__main__":
    main()
