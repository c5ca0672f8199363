"""The nginx edge config (`tokenedge.conf` + `tokenedge.js`) and its renderer."""
