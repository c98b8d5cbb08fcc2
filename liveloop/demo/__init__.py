"""The demo: the traffic simulator, ``liveloop demo``'s orchestration and live view, its report and leak scan."""
