"""project.settings with the LOGGING of commit f941315 (scheduling logger has its own handler)."""
from project.settings import *  # noqa: F401,F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"scheduling": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
