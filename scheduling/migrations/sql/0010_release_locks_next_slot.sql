-- Migration 0010_release_locks_next_slot: the block release_buffered of
-- scheduling/sql/schema.sql as it stood when the migration was made.
-- Frozen history: never edit this file. A change of the schema is a new migration with a file of
-- its own (docs/development.md, Changing the schema).

CREATE OR REPLACE FUNCTION scheduling_release_buffered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_WHEN = 'BEFORE' THEN
        NEW.status := 'pending';
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM scheduling_taskpolicy
                   WHERE periodic_task_id = NEW.periodic_task_id
                     AND overlap_policy IN ('buffer_one', 'buffer_all', 'replace'))
       AND NOT EXISTS (SELECT 1 FROM scheduling_run
                       WHERE periodic_task_id = NEW.periodic_task_id AND status = 'buffered') THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM scheduling_run
    WHERE periodic_task_id = NEW.periodic_task_id AND status = 'pending'
      AND due_at <= clock_timestamp()
    FOR UPDATE;
    PERFORM 1 FROM scheduling_run
    WHERE periodic_task_id = NEW.periodic_task_id AND trigger = 'schedule'
      AND status = 'pending' AND buffered_at IS NULL
    FOR UPDATE;
    UPDATE scheduling_run SET status = 'pending', due_at = clock_timestamp()
    WHERE id = (SELECT id FROM scheduling_run
                WHERE periodic_task_id = NEW.periodic_task_id AND status = 'buffered'
                  AND buffered_at IS NOT NULL
                ORDER BY scheduled_for, id LIMIT 1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_release_buffered AFTER UPDATE OF status ON scheduling_run
    FOR EACH ROW
    WHEN (((OLD.status IN ('dispatched', 'running', 'retrying') AND NEW.status NOT IN ('dispatched', 'running', 'retrying'))
           OR (OLD.status = 'pending' AND OLD.buffered_at IS NOT NULL
               AND NEW.status IN ('succeeded', 'failed', 'missed', 'skipped', 'cancelled', 'expired')))
          AND NEW.periodic_task_id IS NOT NULL)
    EXECUTE FUNCTION scheduling_release_buffered();
CREATE OR REPLACE TRIGGER scheduling_orphan_buffered BEFORE UPDATE OF periodic_task_id
    ON scheduling_run FOR EACH ROW
    WHEN (OLD.status = 'buffered' AND NEW.periodic_task_id IS NULL)
    EXECUTE FUNCTION scheduling_release_buffered();
