"""The flag lists a case (model + cluster + batch) is read by, one each for `megapilot.estimate.cases` and the CLI's
shared layout options (kept free of imports, so the CLI can read them without loading the specs)."""

REQUIRED_FLAGS = ("model", "gpu", "gpus", "gbs", "seq_len")

#: The layout flags that say how the layers split over the pipeline stages (`spec.pipeline.PipelineSplit`'s inputs;
#: `spec.parallel` checks each is a ParallelConfig field).
SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "account_for_embedding", "account_for_loss",
                "pipeline_layout")
