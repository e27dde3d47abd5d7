"""attrscope examples: the bundled demo dataset (reviews.jsonl), demo classifier weights (demo-classifier/) and one
small hand-written dataset per task (tasks/; their columns are described in docs/tasks.md, "Data formats")."""
