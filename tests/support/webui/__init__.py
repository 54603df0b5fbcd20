"""WebUI servers, synthetic stored experiments, running experiments and NNI's own view for the WebUI tests."""
