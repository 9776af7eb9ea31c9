"""The web dashboard under ``/ui`` (docs/dashboard.md): pages rendered on the server with
Jinja2 (templates/), htmx 2 for polling (static/htmx.min.js, from the npm package
htmx.org 2.0.11, with its licence, Zero-Clause BSD, in static/htmx.LICENSE.txt), and
every action a plain form post."""
