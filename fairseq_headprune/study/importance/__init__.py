"""Michel et al. (2019): head importance scores and their files, the ablation studies, importance over training."""
