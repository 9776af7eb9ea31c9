"""``python -m veracity.testing.fake_n8n``: serve a fake n8n (see :func:`main`)."""

from veracity.testing.fake_n8n import main

if __name__ == "__main__":
    main()
