"""Settings for the example deployment, read from the environment.

- ``DATABASE_URL``: PostgreSQL; unset means the embedded server (``project.embedded``). Several
  servers (``postgresql://user@host1:5432,host2:5432/db?target_session_attrs=read-write``) for a
  primary and its standbys: ``project.databases``.
- ``DATABASE_DIRECT_URL``: the same database without a pooler, when ``DATABASE_URL`` goes through
  PgBouncer in transaction mode (``SCHEDULING_DIRECT_DATABASE``).
- ``CELERY_BROKER_URL``: Redis or RabbitMQ; unset means kombu's SQL transport on the database.
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG`` (off unless "1"/"true"), ``DJANGO_ALLOWED_HOSTS``
  (comma separated); HTTPS: ``DJANGO_HTTPS``, ``DJANGO_HSTS_SECONDS``,
  ``DJANGO_HSTS_INCLUDE_SUBDOMAINS``, ``DJANGO_HSTS_PRELOAD``, ``DJANGO_TRUST_X_FORWARDED_PROTO``.
"""

from __future__ import annotations

import os

from project import databases, embedded
from scheduling import cadences

BASE_DIR = embedded.BASE_DIR


def _flag(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _flag("DJANGO_DEBUG")
# Secrets come only from the environment. Unset, a fixed demo key is used, and its prefix makes
# `manage.py check --deploy` report it (security.W009).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or (
    "django-insecure-demo-key-set-DJANGO_SECRET_KEY-in-production"
)
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
    if h.strip()
]

# HTTPS: off by default so the demo and the tests work over plain HTTP; a deployment served
# over HTTPS turns them on (`manage.py check --deploy` reports what is left off).
SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _flag("DJANGO_HTTPS")
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS") or 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("DJANGO_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _flag("DJANGO_HSTS_PRELOAD")
if _flag("DJANGO_TRUST_X_FORWARDED_PROTO"):  # only behind a proxy that sets this header itself
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "scheduling",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL") or embedded.embedded_database_url()
DATABASES = {"default": databases.parse(DATABASE_URL, conn_max_age=0)}
# Behind PgBouncer in transaction mode: DATABASE_URL names the pooler, DATABASE_DIRECT_URL the
# same database without it, for the scheduling app's session-level locks (its system check
# scheduling.E003 says when this is missing). In tests the alias mirrors the test database.
if os.environ.get("DATABASE_DIRECT_URL"):
    DATABASES["direct"] = databases.parse(os.environ["DATABASE_DIRECT_URL"], conn_max_age=0)
    DATABASES["direct"]["TEST"] = {"MIRROR": "default"}
    SCHEDULING_DIRECT_DATABASE = "direct"
# Client-side TCP keepalives and user timeout (libpq; ignored on a Unix socket), the same bounds
# as the server side's (scheduling.ledger.session.Keepalives): a replica or worker cut off from
# the database server silently notices within 5 + 3 x 2 = 11 s, whether it waits for a reply
# (keepalives) or for its own statement to be acknowledged (tcp_user_timeout, milliseconds),
# instead of the system's two hours or fifteen minutes; a connection attempt meanwhile gives
# up after connect_timeout seconds. docs/outages.md, "Network partitions".
for _database in DATABASES.values():
    _database.setdefault("OPTIONS", {}).update(
        keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
        tcp_user_timeout=11_000, connect_timeout=10,
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".data" / "static"

# Bounds the chaos tool and the acceptance tests shorten (seconds; scheduling.conf has defaults),
# and the delivery settings they change: the re-publish limit and the worker-loss policy.
for _name in ("WORKER_LOST_AFTER", "DELIVERY_TIMEOUT", "SUCCESS_DEADLINE"):
    if os.environ.get(f"SCHEDULING_{_name}"):
        globals()[f"SCHEDULING_{_name}"] = float(os.environ[f"SCHEDULING_{_name}"])
# Two internal cadences they shorten too (not settings: constants of scheduling.cadences, set on
# the module at startup; the environment variables keep their old names).
for _name in ("IDLE_IN_TRANSACTION_TIMEOUT", "RECONCILE_INTERVAL"):
    if os.environ.get(f"SCHEDULING_{_name}"):
        setattr(cadences, _name, float(os.environ[f"SCHEDULING_{_name}"]))
if os.environ.get("SCHEDULING_REPUBLISH_LIMIT"):
    SCHEDULING_REPUBLISH_LIMIT = int(os.environ["SCHEDULING_REPUBLISH_LIMIT"])
if os.environ.get("SCHEDULING_WORKER_LOST_POLICY"):
    SCHEDULING_WORKER_LOST_POLICY = os.environ["SCHEDULING_WORKER_LOST_POLICY"]
# The replica's metrics answer without credentials: this host only unless the environment says
# otherwise ('0.0.0.0' on a private network; docs/security.md). The port: SCHEDULING_METRICS_PORT.
SCHEDULING_METRICS_ADDR = os.environ.get("SCHEDULING_METRICS_ADDR") or "127.0.0.1"
# Missed-run alerts: where the webhook posts each run outcome and overdue run (unset: nowhere).
if os.environ.get("SCHEDULING_WEBHOOK_URL"):
    SCHEDULING_WEBHOOK_URL = os.environ["SCHEDULING_WEBHOOK_URL"]

EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "scheduler@example.com"

# Celery: every CELERY_* setting maps to the lower-case Celery option.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or embedded.sql_broker_url(DATABASE_URL)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_BEAT_SCHEDULER = "scheduling.schedulers:LedgerScheduler"
CELERY_TASK_ACKS_LATE = True
# Messages a worker process reserves ahead (Celery's default is 4); the acceptance tests raise it
# to kill a worker holding prefetched runs.
CELERY_WORKER_PREFETCH_MULTIPLIER = int(os.environ.get("CELERY_WORKER_PREFETCH_MULTIPLIER", "1"))
CELERY_TIMEZONE = "UTC"
# What a task prints (the console e-mail backend's e-mails, the demo's digests) is logged at INFO,
# not at Celery's default WARNING: an e-mail sent is news, not a problem.
CELERY_WORKER_REDIRECT_STDOUTS_LEVEL = "INFO"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The worker-side duplicate guard on every task: at most one execution per run (docs/guard.md).
CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # How long Redis waits for an unacknowledged message before redelivering it (seconds); the
    # acceptance suite shortens it to see a killed worker's run redelivered.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(os.environ.get("CELERY_BROKER_VISIBILITY_TIMEOUT", 3600)),
        "unacked_restore_interval": float(os.environ.get("CELERY_BROKER_RESTORE_INTERVAL", 10)),
        "unacked_restore_throttle": int(os.environ.get("CELERY_BROKER_RESTORE_THROTTLE", 10)),
    }
elif CELERY_BROKER_URL.startswith(f"{embedded.SQL_BROKER_ALIAS}+"):
    # The serviceless broker redelivers a message not acknowledged this long after its delivery.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(os.environ.get("CELERY_BROKER_VISIBILITY_TIMEOUT", 3600)),
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # sys.__stderr__: Celery redirects sys.stderr into its own logger in beat and worker processes.
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.__stderr__",
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "scheduling": {"level": os.environ.get("SCHEDULING_LOG_LEVEL", "INFO")},
    },
}
