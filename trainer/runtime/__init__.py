"""What an attempt leaves and reads while it trains: its record (``attempts``), heartbeat, metrics,
progress lines and the stop signal (``preemption``)."""
