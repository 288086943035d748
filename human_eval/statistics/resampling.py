"""How often the human-eval statistics resample, and from which seed: one place for `dwb human-eval report`, the
admin page and joined.html, light to import (the command line reads it for its help).

The headline interval of a preference (Wilson's on the effective number of votes) takes its design effect from
a bootstrap of its own: ``DESIGN_EFFECT_REPLICATES`` draws from ``DESIGN_EFFECT_SEED``, apart from every other
resampling, so the same votes give the same interval, p and stopping point to the printed digit on every surface.
The admin page drew 1,000 from the analysis's shared generator and the report 2,000 ([50.8, 86.3]% against
[51.1, 86.1]% for one vote set). 2,000 keep the design effect's own bootstrap error near 3% (a variance from B
draws has a relative standard error of about sqrt(2 / B)).
"""
DESIGN_EFFECT_REPLICATES = 2000
DESIGN_EFFECT_SEED = 0
REPORT_BOOTSTRAP = 2000  # resamples of the other bootstrap intervals (by prompt, by rater, Bradley-Terry)
