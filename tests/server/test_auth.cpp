// The API key check (server/auth.h).
#include <gtest/gtest.h>

#include "server/auth.h"

using osprey::server::bearer_matches;

TEST(Auth, BearerMatchesOnlyTheExactKey) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));    // a prefix of the key
  EXPECT_FALSE(bearer_matches("Bearer s3crets", "s3cret"));  // the key and more
  EXPECT_FALSE(bearer_matches("Bearer s3creT", "s3cret"));   // the last byte differs
  EXPECT_FALSE(bearer_matches("bearer s3cret", "s3cret"));   // the scheme is case-sensitive here
  EXPECT_FALSE(bearer_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer ", "s3cret"));
  // A header that repeats the expected text (the comparison wraps around it) is still refused.
  EXPECT_FALSE(bearer_matches("Bearer s3cretBearer s3cret", "s3cret"));
  const std::string with_nul("Bearer s3cret\0", 14);
  EXPECT_FALSE(bearer_matches(with_nul, "s3cret"));
}
