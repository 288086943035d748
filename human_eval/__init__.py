"""human_eval: blind pairwise A/B rating in a browser, with confidence intervals and Bradley-Terry rankings."""
