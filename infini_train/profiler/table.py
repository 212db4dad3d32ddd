"""The profiler table, laid out as torch.autograd.profiler_util._build_table prints it (same columns, widths,
number formats and footer), so a profile reads the same in both."""
from __future__ import annotations

COLUMN_WIDTH = 12
SPACING = 2


def format_time(time_us):
    """torch's format: seconds, milliseconds or microseconds with three decimals."""
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def format_share(time_us, total_us):
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def _sort_key(sort_by):
    attr = sort_by.replace("cuda", "device")  # torch's spelling: cuda_time_total reads device_time_total

    def key(event):
        try:
            return getattr(event, attr)
        except AttributeError:
            raise ValueError(f"table: unknown sort_by {sort_by!r}\nHINT: use self_cpu_time_total, cpu_time_total, "
                             "cpu_time, self_cuda_time_total, cuda_time_total or count") from None
    return key


def build_table(events, sort_by=None, row_limit=100, header=None, use_device=None, max_name_column_width=55,
                max_shapes_column_width=80):
    if len(events) == 0:
        return ""
    has_device_time = any(e.self_device_time_total > 0 for e in events)
    has_input_shapes = any(e.input_shapes is not None and len(e.input_shapes) > 0 for e in events)
    if sort_by is not None:
        events = sorted(events, key=_sort_key(sort_by), reverse=True)
    name_width = max(len(e.key) for e in events) + 4
    if max_name_column_width is not None:
        name_width = min(name_width, max_name_column_width)
    shapes_width = max(len(str(e.input_shapes)) for e in events) + 4
    if max_shapes_column_width is not None:
        shapes_width = min(shapes_width, max_shapes_column_width)

    device = (use_device or "cuda").upper()
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device_time:
        headers += [f"Self {device}", f"Self {device} %", f"{device} total", f"{device} time avg"]
    headers.append("# of Calls")
    widths = [name_width] + [COLUMN_WIDTH] * (len(headers) - 1)
    if has_input_shapes:
        headers.append("Input Shapes")
        widths.append(shapes_width)
    row_format = "".join("{: >" + str(w) + "}" + " " * SPACING for w in widths)
    separator = "".join("-" * w + " " * SPACING for w in widths)
    line_length = sum(w + SPACING for w in widths) - SPACING

    total_self_cpu = sum(e.self_cpu_time_total for e in events)
    total_self_device = sum(e.self_device_time_total for e in events)
    lines = []
    if header is not None:
        lines += ["=" * line_length, header]
    lines += [separator, row_format.format(*headers), separator]
    for shown, e in enumerate(events):
        if shown == row_limit:
            break
        name = e.key
        if max_name_column_width is not None and len(name) >= max_name_column_width - 3:
            name = name[:max_name_column_width - 3] + "..."
        row = [name, format_share(e.self_cpu_time_total, total_self_cpu), format_time(e.self_cpu_time_total),
               format_share(e.cpu_time_total, total_self_cpu), format_time(e.cpu_time_total), format_time(e.cpu_time)]
        if has_device_time:
            row += [format_time(e.self_device_time_total), format_share(e.self_device_time_total, total_self_device),
                    format_time(e.device_time_total), format_time(e.device_time)]
        row.append(e.count)
        if has_input_shapes:
            row.append(str(e.input_shapes)[:shapes_width])
        lines.append(row_format.format(*row))
    lines += [separator, f"Self CPU time total: {format_time(total_self_cpu)}"]
    if has_device_time:
        lines.append(f"Self {device} time total: {format_time(total_self_device)}")
    return "\n".join(lines) + "\n"


__all__ = ["build_table", "format_time", "format_share"]
