"""The viewer: runs, reports and every trial in a browser, read from the store.

`hemra serve` runs it beside the queue's supervisor, `hemra view` alone. `app.py` holds the
routes and the token check, `api.py` and `trials.py` the JSON API (docs/viewer.md), `static/`
the pages (plain HTML, CSS and JavaScript modules, no build step, nothing from the internet).
"""
