"""The stages of ``attr-compute run``, in the order compute.runner calls them; each module imports only the stages
before it (for their types), never the runner:

1. plan (options -> a validated, frozen RunPlan; config.py derives the settings from the option declarations)
2. load (model, tokenizer, dataset)
3. head_masks (mask_lrp's head-statistics pass)
4. batches (tokenise, windows, length-sorted batches)
5. dispatch (the forward pass and every method, one batch)
6. write (layouts, provenance, the store's writer, examples cut to length)
7. metrics (faithfulness metrics over the finished store)
"""
