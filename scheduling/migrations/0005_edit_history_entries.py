"""The edit history's plural: "edit history entries", so the admin's changelist counts "7 edit
history entries", not "7 edit history". Options only: no SQL."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [("scheduling", "0004_guard_execution_functions")]

    operations = [
        migrations.AlterModelOptions(
            name="taskhistory",
            options={
                "ordering": ["-changed_at", "-id"],
                "verbose_name": "edit history entry",
                "verbose_name_plural": "edit history entries",
            },
        ),
    ]
