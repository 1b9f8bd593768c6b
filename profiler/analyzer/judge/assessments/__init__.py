"""The assessments: what each later judgement says of the detectors' candidates (prices, causes, "explained by"), in the order judge/judgement.py lists them."""
