"""Writers that take a stored run elsewhere: Chrome Trace Event JSON (`chrome`), OTLP replay (`otlp`)."""
