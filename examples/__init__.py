"""attrscope examples: the bundled demo dataset (reviews.jsonl) and demo classifier weights (demo-classifier/)."""
