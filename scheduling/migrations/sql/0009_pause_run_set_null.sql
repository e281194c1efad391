-- Migration 0009_pause_run_set_null: the block pause_run_set_null of scheduling/sql/schema.sql
-- as it stood when the migration was made.
-- Frozen history: never edit this file. A change of the schema is a new migration with a file of
-- its own (docs/development.md, Changing the schema).

ALTER TABLE scheduling_pause
    DROP CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id,
    ADD CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id
        FOREIGN KEY (run_id) REFERENCES scheduling_run (id)
        ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;
