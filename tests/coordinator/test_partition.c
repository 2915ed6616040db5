/* test_partition.c — layer placement: vLLM's even split, explicit lists, refusals. */
#include "coordinator/config/partition.h"
#include "tests/testutil.h"

static void check_split(int n_layers, int n_stages, const int *want) {
    int c[PLACE_MAX_STAGES];
    st_err e;
    REQUIRE_MSG(place_even_split(n_layers, n_stages, c, &e) == 0, "%s", e.msg);
    for (int i = 0; i < n_stages; i++) CHECK_EQ_INT(c[i], want[i]);
}

int main(void) {
    check_split(5, 2, (int[]){3, 2});
    check_split(5, 3, (int[]){2, 2, 1});
    check_split(5, 5, (int[]){1, 1, 1, 1, 1});
    check_split(5, 1, (int[]){5});
    check_split(32, 3, (int[]){11, 11, 10});
    check_split(80, 6, (int[]){14, 14, 13, 13, 13, 13});
    check_split(7, 4, (int[]){2, 2, 2, 1});

    st_err e;
    int c[PLACE_MAX_STAGES];
    CHECK(place_even_split(5, 6, c, &e) == -1);
    CHECK(strstr(e.msg, "6 stages for 5 layers") != NULL);
    CHECK(place_even_split(5, 0, c, &e) == -1);
    CHECK(place_even_split(0, 1, c, &e) == -1);

    /* Ranges from the default rule. */
    place_range r[PLACE_MAX_STAGES];
    REQUIRE(place_partition(5, 2, NULL, 0, r, &e) == 0);
    CHECK_EQ_INT(r[0].first, 0);
    CHECK_EQ_INT(r[0].last, 3);
    CHECK_EQ_INT(r[1].first, 3);
    CHECK_EQ_INT(r[1].last, 5);

    /* Explicit list overrides. */
    int n = 0;
    REQUIRE(place_parse_list(" 2, 2 ,1", c, PLACE_MAX_STAGES, &n, &e) == 0);
    CHECK_EQ_INT(n, 3);
    REQUIRE(place_partition(5, 3, c, n, r, &e) == 0);
    CHECK_EQ_INT(r[0].last, 2);
    CHECK_EQ_INT(r[1].first, 2);
    CHECK_EQ_INT(r[1].last, 4);
    CHECK_EQ_INT(r[2].first, 4);
    CHECK_EQ_INT(r[2].last, 5);
    REQUIRE(place_partition(5, 2, (int[]){1, 4}, 2, r, &e) == 0);
    CHECK_EQ_INT(r[0].last, 1);
    CHECK_EQ_INT(r[1].last, 5);

    /* Refusals: sum mismatch, zero-layer stage, count/stage mismatch, too many stages. */
    CHECK(place_partition(5, 2, (int[]){3, 3}, 2, r, &e) == -1);
    CHECK(strstr(e.msg, "hold 6 layers but the model has 5") != NULL);
    CHECK(place_partition(5, 2, (int[]){2, 2}, 2, r, &e) == -1);
    CHECK(place_partition(5, 3, (int[]){5, 0, 0}, 3, r, &e) == -1);
    CHECK(strstr(e.msg, "stage 1 has 0 layers") != NULL);
    CHECK(place_partition(5, 3, (int[]){3, 2}, 2, r, &e) == -1);
    CHECK(strstr(e.msg, "2 layer counts given for 3 stages") != NULL);
    CHECK(place_partition(2, 3, NULL, 0, r, &e) == -1);
    CHECK(place_check(2, (int[]){1, 1, 0}, 3, &e) == -1);

    /* List syntax errors. */
    CHECK(place_parse_list("", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("3,", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("3,,2", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("3;2", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("0,5", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("-1,6", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("a", c, 8, &n, &e) == -1);
    CHECK(place_parse_list("1,1,1", c, 2, &n, &e) == -1);
    return test_summary();
}
