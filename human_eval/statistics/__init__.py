"""The arithmetic of a study's votes: preference rates with their intervals and sign tests (``stats``), the
bootstrap's seeds and sizes (``resampling``), Bradley-Terry strengths (``bradley_terry``) with image covariates
(``style_control``), rater agreement (``agreement``) and which pair to show next (``allocation``). Pure
arithmetic: no database, no server, no files."""
