"""`dwb demo`: the whole workbench on the offline shapes domain. It sits above the packages it drives
(train, evaluate, human_eval); none of them imports it."""
