"""R1-Zero and R1's five stages (`config.job = "r1_pipeline"`): pipeline.py runs them, layout.py says where each
writes, stage_config.py derives and checks each stage's config, corpus.py and rejection.py make the SFT data,
rewards.py holds the R1 reward terms, heldout.py and report.py score every model and write DIR/report.md."""
