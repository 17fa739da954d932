"""The SageMaker backend: one multi-instance training job per cell, ranks spread over all of it."""
