"""The Varnish edge config (`tokenedge.vcl`) and its renderer."""
