"""Each human-preference scorer's published weights: what a config key or flag given alone loads. Apart from the
scorers, which import torch: the command line lists these defaults in its help without loading it."""

PREFERENCE_WEIGHTS = {"pickscore": "yuvalkirstain/PickScore_v1", "hps": "xswu/HPSv2", "imagereward": "THUDM/ImageReward",
                      "aesthetic": "sac+logos+ava1-l14-linearMSE.pth"}
