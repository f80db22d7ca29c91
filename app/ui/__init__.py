"""Presentation: the judging and report pages, and the calibration report.

The pages (HTML, JS, CSS) are served by ``app.api.routers.ui``; ``report.py`` draws
the reliability diagram and renders the HTML report from ``templates/``. It imports
nothing else of the app.
"""
