"""it.profiler: torch.profiler's API over the op observers. ``profile`` records ops' forward and backward,
collectives, optimizer steps and ``record_function`` ranges; ``key_averages().table()`` prints torch's table;
``export_chrome_trace`` / ``merge_chrome_traces`` write traces for ui.perfetto.dev."""
from .chrome_trace import merge_chrome_traces, merge_traces
from .events import EventList, FunctionEvent, FunctionEventAvg
from .module_ranges import module_ranges
from .profile import ProfilerActivity, profile, record_function

__all__ = ["profile", "record_function", "ProfilerActivity", "EventList", "FunctionEvent", "FunctionEventAvg",
           "merge_chrome_traces", "merge_traces", "module_ranges"]
