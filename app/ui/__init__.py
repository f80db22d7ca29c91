"""The judging page (HTML, JS, CSS), served by ``app.api.routers.ui``."""
