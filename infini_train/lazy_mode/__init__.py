"""Lazy mode: ``with it.lazy():`` records ops instead of computing them, computes a tensor when its value is
needed, never computes unused results, and fuses chains of element-wise ops into one pass over memory.
mode.py holds the switch (``it.lazy`` is its ``lazy`` class, with ``realize``, ``realize_all`` and
``fusion_stats`` as static methods); graph.py the recording and realisation; fusion.py the fusion rule."""
from .mode import is_lazy_enabled, lazy

realize = lazy.realize
realize_all = lazy.realize_all
fusion_stats = lazy.fusion_stats
reset_fusion_stats = lazy.reset_fusion_stats

__all__ = ["lazy", "is_lazy_enabled", "realize", "realize_all", "fusion_stats", "reset_fusion_stats"]
