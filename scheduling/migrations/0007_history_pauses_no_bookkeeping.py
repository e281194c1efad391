"""The edit history without bookkeeping saves, and with pauses: schema.sql's block ``history``
as it stood when this migration was made (``sql/0007_history_pauses_no_bookkeeping.sql``), and
the entry kind ``pause`` with its operations ``paused`` and ``resumed``.

A save that changed no field still wrote an entry and a new version: django-celery-beat's
``save()`` (its admin's too) moves ``date_changed``, which the trigger compared with the other
columns. It now drops ``date_changed`` from each row as it drops ``last_run_at`` and
``total_run_count``. A pause or resume is written by ``ledger.pause`` / ``ledger.resume`` with
the version in force, so one version per task holds only for definition changes: the unique
constraint now leaves pause entries out.

Reverse: the block as it stood (``_BEFORE``), and the constraint over every entry again (which
fails while pause entries share a version: delete them first).
"""

from pathlib import Path

from django.db import migrations, models

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()

#: schema.sql's block ``history`` before this migration (as 0003 set it).
_BEFORE = r"""
CREATE OR REPLACE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    operation text := CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                      ELSE 'changed' END;
    source text;
    tasks text;
BEGIN
    -- The rows, each as (object_id, old, new): old NULL for an INSERT, new NULL for a DELETE.
    source := CASE TG_OP
        WHEN 'INSERT' THEN format(
            'SELECT n.%1$I AS object_id, NULL::jsonb AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count}''::text[] AS new'
            ' FROM scheduling_new_rows AS n', key)
        WHEN 'DELETE' THEN format(
            'SELECT o.%1$I AS object_id,'
            ' to_jsonb(o) - ''{last_run_at,total_run_count}''::text[] AS old,'
            ' NULL::jsonb AS new FROM scheduling_old_rows AS o', key)
        ELSE format(
            'SELECT n.%1$I AS object_id,'
            ' to_jsonb(o) - ''{last_run_at,total_run_count}''::text[] AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count}''::text[] AS new'
            ' FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.%1$I = n.%1$I',
            key)
        END;
    -- The tasks each changed row belongs to, with their names: a task row is its own; a
    -- schedule row belongs to every task on it; a policy to its task.
    tasks := CASE kind
        WHEN 'task' THEN
            'SELECT c.object_id AS task_id, COALESCE(c.new, c.old)->>''name'' AS task_name, c.*'
            ' FROM change AS c'
        WHEN 'policy' THEN
            'SELECT t.id AS task_id, t.name AS task_name, c.* FROM change AS c'
            ' JOIN django_celery_beat_periodictask AS t ON t.id = c.object_id'
        ELSE format(
            'SELECT t.id AS task_id, t.name AS task_name, c.* FROM change AS c'
            ' JOIN django_celery_beat_periodictask AS t ON t.%I = c.object_id', kind || '_id')
        END;
    -- OFFSET 0 keeps each row's two to_jsonb from being computed again in the lateral pass.
    EXECUTE format($q$
        WITH change AS (
            SELECT d.object_id, d.old, d.new, x.before, x.after
            FROM (%s OFFSET 0) AS d
            CROSS JOIN LATERAL (
                SELECT CASE WHEN d.old IS NULL OR d.new IS NULL THEN d.old
                            ELSE jsonb_object_agg(e.key, e.value) END AS before,
                       CASE WHEN d.old IS NULL OR d.new IS NULL THEN d.new
                            ELSE jsonb_object_agg(e.key, d.new->e.key) END AS after,
                       count(e.key) AS changed
                FROM jsonb_each(CASE WHEN d.new IS NOT NULL THEN d.old END) AS e
                WHERE d.new->e.key IS DISTINCT FROM e.value
            ) AS x
            WHERE d.old IS NULL OR d.new IS NULL OR x.changed > 0
        ),
        affected AS (%s),
        bumped AS (
            INSERT INTO scheduling_taskversion (periodic_task_id, version)
            SELECT task_id, 1 FROM affected ORDER BY task_id
            ON CONFLICT (periodic_task_id)
                DO UPDATE SET version = scheduling_taskversion.version + 1
            RETURNING periodic_task_id, version
        )
        INSERT INTO scheduling_taskhistory
            (periodic_task_id, periodic_task_name, version, kind, object_id, operation,
             before, after, changed_at, actor, role)
        SELECT a.task_id, a.task_name, b.version, $1, a.object_id, $2, a.before, a.after,
               clock_timestamp(), COALESCE(current_setting('scheduling.actor', true), ''),
               current_user
        FROM affected AS a JOIN bumped AS b ON b.periodic_task_id = a.task_id
    $q$, source, tasks) USING kind, operation;
    IF kind = 'task' AND TG_OP = 'DELETE' THEN
        DELETE FROM scheduling_taskversion
        WHERE periodic_task_id IN (SELECT o.id FROM scheduling_old_rows AS o);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_history_task_insert
    AFTER INSERT ON django_celery_beat_periodictask
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_task_update
    AFTER UPDATE ON django_celery_beat_periodictask
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_task_delete
    AFTER DELETE ON django_celery_beat_periodictask
    REFERENCING OLD TABLE AS scheduling_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_interval_update
    AFTER UPDATE ON django_celery_beat_intervalschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('interval', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_crontab_update
    AFTER UPDATE ON django_celery_beat_crontabschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('crontab', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_solar_update
    AFTER UPDATE ON django_celery_beat_solarschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('solar', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_clocked_update
    AFTER UPDATE ON django_celery_beat_clockedschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('clocked', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_insert
    AFTER INSERT ON scheduling_taskpolicy
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_update
    AFTER UPDATE ON scheduling_taskpolicy
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_delete
    AFTER DELETE ON scheduling_taskpolicy
    REFERENCING OLD TABLE AS scheduling_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
"""


class Migration(migrations.Migration):

    dependencies = [("scheduling", "0006_operator_help_texts")]

    operations = [
        migrations.RunSQL(_SQL, reverse_sql=_BEFORE),
        migrations.RemoveConstraint(
            model_name="taskhistory",
            name="scheduling_history_one_per_version",
        ),
        migrations.AlterField(
            model_name="taskhistory",
            name="kind",
            field=models.CharField(
                choices=[
                    ("task", "Task"), ("interval", "Interval"), ("crontab", "Crontab"),
                    ("solar", "Solar"), ("clocked", "Clocked"), ("policy", "Policy"),
                    ("pause", "Pause"),
                ],
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="taskhistory",
            name="operation",
            field=models.CharField(
                choices=[
                    ("created", "Created"), ("changed", "Changed"), ("deleted", "Deleted"),
                    ("recorded", "Recorded"), ("paused", "Paused"), ("resumed", "Resumed"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="taskhistory",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "pause"), _negated=True),
                fields=("periodic_task_id", "version"),
                name="scheduling_history_one_per_version",
            ),
        ),
    ]
