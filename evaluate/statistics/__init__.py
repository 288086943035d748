"""The numbers a row reports and how sure they are: FID, KID, CMMD and their Frechet references (``metrics``),
FD-infinity, precision, recall, density and coverage (``prdc``), and the prompt bootstrap every interval and
paired p-value comes from (``bootstrap``). Pure arithmetic on features and scores: no models, no files."""
