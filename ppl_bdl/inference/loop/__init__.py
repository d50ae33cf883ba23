"""The one loop every iterative method runs: chains stepped in compiled chunks, minibatches, runs
spread over devices, and what a run that stops early keeps."""
