"""Edit history: every change of a periodic task, its schedule row or its policy, kept by triggers.

Statement-level triggers (transition tables, like migration 0005's change log) on
django-celery-beat's periodic task table (insert, update, delete), its four schedule tables
(update: a new schedule row changes nothing until a task uses it, and deleting one deletes its
tasks, which is recorded) and ``scheduling_taskpolicy`` write one ``scheduling_taskhistory`` row
per task and change, with the changed columns before and after, the admin user passed in the
transaction-local setting ``scheduling.actor`` and the SQL role, and add 1 to the task's version
counter (``scheduling_taskversion``) in the same statement. A statement whose rows changed only
the bookkeeping columns a claim writes (``last_run_at``, ``total_run_count``) records nothing:
one join of the transition tables, no row written. The tasks existing now get version 1 and a
``recorded`` entry holding their definition as it stands.

Why our own triggers and not django-pghistory: see docs/history.md.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

# Every to_jsonb of a row drops the periodic task's bookkeeping columns, last_run_at and
# total_run_count: a claim writes them at each dispatch; they are no part of the definition.
_FUNCTIONS = """
CREATE FUNCTION scheduling_write_history(kind text, operation text, changes jsonb)
RETURNS void LANGUAGE sql AS $$
    WITH change AS (
        SELECT NULLIF(c->0, 'null') AS old, NULLIF(c->1, 'null') AS new,
               COALESCE(COALESCE(NULLIF(c->1, 'null'), c->0)->>'id',
                        COALESCE(NULLIF(c->1, 'null'), c->0)->>'periodic_task_id')::integer
                   AS object_id
        FROM jsonb_array_elements(changes) AS c
    ),
    affected AS (
        SELECT c.object_id AS task_id, COALESCE(c.new, c.old)->>'name' AS task_name, c.*
        FROM change AS c WHERE kind = 'task'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t
            ON (kind = 'interval' AND t.interval_id = c.object_id)
            OR (kind = 'crontab' AND t.crontab_id = c.object_id)
            OR (kind = 'solar' AND t.solar_id = c.object_id)
            OR (kind = 'clocked' AND t.clocked_id = c.object_id)
            OR (kind = 'policy' AND t.id = c.object_id)
    ),
    bumped AS (
        -- In task id order, so two statements bumping the same tasks cannot deadlock.
        INSERT INTO scheduling_taskversion (periodic_task_id, version)
        SELECT task_id, 1 FROM affected ORDER BY task_id
        ON CONFLICT (periodic_task_id)
            DO UPDATE SET version = scheduling_taskversion.version + 1
        RETURNING periodic_task_id, version
    )
    INSERT INTO scheduling_taskhistory
        (periodic_task_id, periodic_task_name, version, kind, object_id, operation,
         before, after, changed_at, actor, role)
    SELECT a.task_id, a.task_name, b.version, kind, a.object_id, operation,
           CASE WHEN a.old IS NULL OR a.new IS NULL THEN a.old ELSE
               (SELECT jsonb_object_agg(key, value) FROM jsonb_each(a.old)
                WHERE a.new->key IS DISTINCT FROM value) END,
           CASE WHEN a.old IS NULL OR a.new IS NULL THEN a.new ELSE
               (SELECT jsonb_object_agg(key, value) FROM jsonb_each(a.new)
                WHERE a.old->key IS DISTINCT FROM value) END,
           clock_timestamp(), COALESCE(current_setting('scheduling.actor', true), ''),
           current_user
    FROM affected AS a JOIN bumped AS b ON b.periodic_task_id = a.task_id;
$$;

-- TG_ARGV: the kind of row ('task', 'crontab', ...) and its key column ('id', 'periodic_task_id').
CREATE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    changes jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT jsonb_agg(jsonb_build_array(NULL, to_jsonb(n) - '{last_run_at,total_run_count}'::text[])) INTO changes
        FROM scheduling_new_rows AS n;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(o) - '{last_run_at,total_run_count}'::text[], NULL)) INTO changes
        FROM scheduling_old_rows AS o;
    ELSE
        SELECT jsonb_agg(jsonb_build_array(c.old, c.new)) INTO changes
        FROM (
            SELECT to_jsonb(o) - '{last_run_at,total_run_count}'::text[] AS old, to_jsonb(n) - '{last_run_at,total_run_count}'::text[] AS new
            FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o
                ON to_jsonb(o)->key = to_jsonb(n)->key
        ) AS c
        WHERE c.old IS DISTINCT FROM c.new;
    END IF;
    IF changes IS NOT NULL THEN
        PERFORM scheduling_write_history(
            kind, CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                  ELSE 'changed' END, changes);
    END IF;
    IF kind = 'task' AND TG_OP = 'DELETE' THEN
        DELETE FROM scheduling_taskversion
        WHERE periodic_task_id IN (SELECT o.id FROM scheduling_old_rows AS o);
    END IF;
    RETURN NULL;
END
$$;
"""


def _triggers(table: str, kind: str, key: str, operations: tuple[str, ...]) -> str:
    references = {
        "insert": "REFERENCING NEW TABLE AS scheduling_new_rows",
        "update": "REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows",
        "delete": "REFERENCING OLD TABLE AS scheduling_old_rows",
    }
    return "".join(
        f"CREATE TRIGGER scheduling_history_{kind}_{op} AFTER {op.upper()} ON {table}\n"
        f"    {references[op]}\n"
        f"    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('{kind}', '{key}');\n"
        for op in operations
    )


_TABLES = (
    ("django_celery_beat_periodictask", "task", "id", ("insert", "update", "delete")),
    ("django_celery_beat_intervalschedule", "interval", "id", ("update",)),
    ("django_celery_beat_crontabschedule", "crontab", "id", ("update",)),
    ("django_celery_beat_solarschedule", "solar", "id", ("update",)),
    ("django_celery_beat_clockedschedule", "clocked", "id", ("update",)),
    ("scheduling_taskpolicy", "policy", "periodic_task_id", ("insert", "update", "delete")),
)

_TRIGGERS = "".join(_triggers(*table) for table in _TABLES)

# The tasks that exist now: version 1, and their definition as it stands.
_BASELINE = """
INSERT INTO scheduling_taskversion (periodic_task_id, version)
SELECT id, 1 FROM django_celery_beat_periodictask;
INSERT INTO scheduling_taskhistory
    (periodic_task_id, periodic_task_name, version, kind, object_id, operation, before, after,
     changed_at, actor, role)
SELECT t.id, t.name, 1, 'task', t.id, 'recorded', NULL, to_jsonb(t) - '{last_run_at,total_run_count}'::text[],
       clock_timestamp(), '', current_user
FROM django_celery_beat_periodictask AS t;
"""

_DROP = "".join(
    f"DROP TRIGGER IF EXISTS scheduling_history_{kind}_{op} ON {table};\n"
    for table, kind, _, operations in _TABLES
    for op in operations
) + """
DROP FUNCTION IF EXISTS scheduling_record_history();
DROP FUNCTION IF EXISTS scheduling_write_history(text, text, jsonb);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("scheduling", "0015_overdue"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskVersion",
            fields=[
                (
                    "periodic_task",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="scheduling_version",
                        serialize=False,
                        to="django_celery_beat.periodictask",
                    ),
                ),
                ("version", models.PositiveIntegerField(default=1)),
            ],
        ),
        migrations.CreateModel(
            name="TaskHistory",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("periodic_task_id", models.IntegerField()),
                ("periodic_task_name", models.CharField(max_length=200)),
                ("version", models.PositiveIntegerField()),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("task", "Task"), ("interval", "Interval"), ("crontab", "Crontab"),
                            ("solar", "Solar"), ("clocked", "Clocked"), ("policy", "Policy"),
                        ],
                        max_length=16,
                    ),
                ),
                ("object_id", models.IntegerField(help_text="Id of the row that changed.")),
                (
                    "operation",
                    models.CharField(
                        choices=[
                            ("created", "Created"), ("changed", "Changed"),
                            ("deleted", "Deleted"), ("recorded", "Recorded"),
                        ],
                        max_length=16,
                    ),
                ),
                ("before", models.JSONField(blank=True, null=True)),
                ("after", models.JSONField(blank=True, null=True)),
                (
                    "changed_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "actor",
                    models.CharField(
                        blank=True, help_text="Admin user, when known.", max_length=150
                    ),
                ),
                ("role", models.CharField(max_length=150, verbose_name="SQL role")),
            ],
            options={
                "verbose_name": "edit history entry",
                "verbose_name_plural": "edit history",
                "ordering": ["-changed_at", "-id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("periodic_task_id", "version"),
                        name="scheduling_history_one_per_version",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="run",
            name="definition_version",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="The task's definition version this run was planned from (its edit "
                "history entry); empty for runs planned before the history began.",
                null=True,
            ),
        ),
        migrations.RunSQL(_FUNCTIONS + _TRIGGERS + _BASELINE, _DROP),
    ]
