"""The ops dashboard: the loop's health, checkpoints with the gate's reasons, the promotion history, and
the operator's promote / roll back / reject, recorded exactly as the CLI records them.

Server-rendered (FastAPI + Jinja2, inline SVG charts with their values in a table beside them), a few
lines of JavaScript that poll the overview's JSON. It reads PostgreSQL, MLflow and the components'
status endpoints; it never reads the events topic. Run it with ``python -m liveloop.dashboard``.
"""
