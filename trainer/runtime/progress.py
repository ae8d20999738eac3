"""The human progress line rank 0 prints every ``train.log_every`` steps."""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    seconds = round(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_line(
    step: int,
    max_steps: int,
    loss: float,
    lr: float,
    tokens_per_s: float,
    elapsed_s: float,
    steps_this_attempt: int,
    *,
    mfu: float | None = None,
    peak_mem_gib: float | None = None,
) -> str:
    """``step 40/100 loss 2.314 lr 2.1e-03 tok/s 12,345 elapsed 12s eta 18s [mfu 41.2%] [mem 12.3GiB]``.

    The ETA extrapolates this attempt's own pace (a resumed attempt did not do earlier steps).
    ``mfu`` is a fraction (0.412 prints ``mfu 41.2%``); each optional field appears only when given.
    """
    per_step = elapsed_s / steps_this_attempt if steps_this_attempt > 0 else 0.0
    eta = per_step * max(0, max_steps - step)
    line = (
        f"step {step}/{max_steps} loss {loss:.3f} lr {lr:.1e} tok/s {tokens_per_s:,.0f} "
        f"elapsed {format_duration(elapsed_s)} eta {format_duration(eta)}"
    )
    if mfu is not None:
        line += f" mfu {100 * mfu:.1f}%"
    if peak_mem_gib is not None:
        line += f" mem {peak_mem_gib:.1f}GiB"
    return line
