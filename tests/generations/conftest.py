from tests._helpers import store_fixture

store = store_fixture(pool_size=4)
