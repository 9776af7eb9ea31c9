"""``python -m veracity.testing.fake_n8n``: serve a fake n8n (:func:`.cli.main`)."""

from veracity.testing.fake_n8n.cli import main

if __name__ == "__main__":
    main()
