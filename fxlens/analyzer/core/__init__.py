"""The core types every room shares: the plain frozen graph, the rule contract (`costs`),
the Report and its typed sections, the pass protocol, errors and the loaded model."""
