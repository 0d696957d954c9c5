"""The redirection-wait admission webhook (issue 6): decide, certs, config, server, misses."""

from ambient_operator.webhook.config import WebhookOptions
from ambient_operator.webhook.server import Webhook, register

__all__ = ["Webhook", "WebhookOptions", "register"]
