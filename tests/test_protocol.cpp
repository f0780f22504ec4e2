// The advertisement wire form, its strict parsing, hex, CRC32C, and the escaping of outside text
// in error messages.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/result.hpp"

namespace dma {
namespace {

std::vector<std::byte> filled(std::size_t size, std::uint8_t value) {
  return std::vector<std::byte>(size, std::byte{value});
}

// The error message of a parse that must fail, or a test failure if it succeeded.
template <typename T>
std::string error_of(const Result<T>& result) {
  if (result) {
    ADD_FAILURE() << "expected an error";
    return {};
  }
  EXPECT_EQ(result.error().code(), ErrorCode::kInvalidArgument);
  return result.error().message();
}

// --- CRC32C ---------------------------------------------------------------------------------

TEST(Crc32c, TheStandardCheckValueMatchesCastagnoli) {
  // Breaks: checksums disagree with every other CRC32C implementation (the client's, ext4's).
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
}

TEST(Crc32c, EmptyInputChecksumsToZeroWithoutTouchingTheBuffer) {
  // Breaks: a zero-length transfer crashes isa-l with a null pointer or gets a nonzero checksum.
  EXPECT_EQ(crc32c(std::span<const std::byte>()), 0u);
  EXPECT_EQ(crc32c(std::string_view()), 0u);
  EXPECT_EQ(crc32c_extend(0xE3069283u, std::span<const std::byte>()), 0xE3069283u);
}

TEST(Crc32c, ThirtyTwoZeroBytesMatchTheRfc3720Vector) {
  // Breaks: the initial value or final inversion is wrong, which "123456789" alone can miss.
  EXPECT_EQ(crc32c(filled(32, 0x00)), 0x8A9136AAu);
}

TEST(Crc32c, ThirtyTwoOnesBytesMatchTheRfc3720Vector) {
  // Breaks: the polynomial or bit order is wrong for high bytes.
  EXPECT_EQ(crc32c(filled(32, 0xFF)), 0x62A8AB43u);
}

TEST(Crc32c, ExtendingPieceByPieceEqualsTheWhole) {
  // Breaks: a checksum computed over a transfer's chunks differs from the whole buffer's.
  std::vector<std::byte> bytes(257);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 31 + 7);
  const std::uint32_t whole = crc32c(bytes);
  const std::span<const std::byte> all(bytes);
  for (std::size_t split = 0; split <= bytes.size(); ++split) {
    EXPECT_EQ(crc32c_extend(crc32c(all.first(split)), all.subspan(split)), whole) << split;
  }
  EXPECT_EQ(crc32c_extend(crc32c("1234"), std::as_bytes(std::span<const char>("56789", 5))),
            0xE3069283u);
}

TEST(Crc32c, CombiningThePiecesChecksumsEqualsTheWhole) {
  // Breaks: a value checksummed piece by piece as it lands (worker/delivery.hpp) is answered
  // with a checksum that matches no client's, and every large DMA.SET is refused as corrupt.
  std::vector<std::byte> bytes(3 * 4096 + 17);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i * 131 + 11) & 0xFF);
  const std::span<const std::byte> all(bytes);
  const std::uint32_t whole = crc32c(all);
  for (std::size_t split : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096},
                            std::size_t{4097}, bytes.size() - 1, bytes.size()}) {
    EXPECT_EQ(crc32c_combine(crc32c(all.first(split)), crc32c(all.subspan(split)),
                             all.size() - split),
              whole)
        << split;
  }
  // Three pieces, joined left to right.
  const std::uint32_t left = crc32c_combine(crc32c(all.first(100)), crc32c(all.subspan(100, 5000)), 5000);
  EXPECT_EQ(crc32c_combine(left, crc32c(all.subspan(5100)), all.size() - 5100), whole);
  EXPECT_EQ(crc32c_combine(crc32c("1234"), crc32c("56789"), 5), 0xE3069283u);
  // A length past 32 bits: appending 2^32 zero bytes and then combining with nothing must
  // agree with the shift applied in halves (the powers table reaches every 64-bit length).
  const std::uint32_t a = crc32c("123456789");
  const std::uint32_t zeros_2_31 = crc32c_combine(a, 0, std::uint64_t{1} << 31);
  EXPECT_EQ(crc32c_combine(zeros_2_31, 0, std::uint64_t{1} << 31),
            crc32c_combine(a, 0, std::uint64_t{1} << 32));
}

TEST(Crc32c, FlippingAnySingleBitOfTheBufferChangesTheChecksum) {
  // Breaks: a one-bit corruption in transit (the error CRC32C exists to catch) goes unnoticed
  // at some bit position, e.g. because a chunk boundary or the tail is skipped.
  std::vector<std::byte> bytes(67);  // odd, to reach isa-l's tail handling past 8-byte words
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 131 + 17);
  const std::uint32_t original = crc32c(bytes);
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    bytes[bit / 8] ^= std::byte(1u << (bit % 8));
    EXPECT_NE(crc32c(bytes), original) << "bit " << bit;
    bytes[bit / 8] ^= std::byte(1u << (bit % 8));
  }
  EXPECT_EQ(crc32c(bytes), original);
}

TEST(Crc32c, SwappingTwoBlocksChangesTheChecksum) {
  // Breaks: pieces of a transfer landing in the wrong order (two RMA pieces swapped) still pass
  // the checksum, as they would with an order-blind sum.
  std::vector<std::byte> bytes(128);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 3);
  const std::uint32_t original = crc32c(bytes);
  std::vector<std::byte> swapped(bytes.begin() + 64, bytes.end());
  swapped.insert(swapped.end(), bytes.begin(), bytes.begin() + 64);
  EXPECT_NE(crc32c(swapped), original);
  // And two distinct single bytes, the smallest reordering.
  std::swap(bytes[10], bytes[90]);
  EXPECT_NE(crc32c(bytes), original);
}

// --- hex ------------------------------------------------------------------------------------

TEST(Hex, EveryByteValueRoundTrips) {
  // Breaks: some fabric address bytes are mangled on their way through the advertisement.
  std::vector<std::uint8_t> bytes(256);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i);
  auto decoded = hex_decode(hex_encode(bytes));
  ASSERT_TRUE(decoded) << decoded.error().describe();
  EXPECT_EQ(*decoded, bytes);
}

TEST(Hex, EncodingIsLowercase) {
  // Breaks: the wire form has two spellings, and peers comparing advertisements as text disagree.
  EXPECT_EQ(hex_encode(std::vector<std::uint8_t>{0xAB, 0xCD, 0xEF, 0x01}), "abcdef01");
}

TEST(Hex, DecodingAcceptsUppercaseAndMixedCase) {
  // Breaks: a client that prints its address in uppercase is refused.
  auto decoded = hex_decode("ABcdEf");
  ASSERT_TRUE(decoded) << decoded.error().describe();
  EXPECT_EQ(*decoded, (std::vector<std::uint8_t>{0xAB, 0xCD, 0xEF}));
}

TEST(Hex, EmptyTextIsAnError) {
  // Breaks: an empty address reaches fi_av_insert.
  EXPECT_EQ(error_of(hex_decode("")), "address is empty");
}

TEST(Hex, OddLengthIsAnError) {
  // Breaks: a truncated address silently loses its last nibble.
  EXPECT_NE(error_of(hex_decode("abc")).find("odd"), std::string::npos);
}

TEST(Hex, ANonHexCharacterIsNamedWithItsOffset) {
  // Breaks: the operator cannot tell where a corrupted advertisement went wrong.
  const std::string message = error_of(hex_decode("00a1g2"));
  EXPECT_NE(message.find("'g'"), std::string::npos) << message;
  EXPECT_NE(message.find("offset 4"), std::string::npos) << message;
  // The second nibble of a pair is checked too.
  EXPECT_NE(error_of(hex_decode("0z")).find("offset 1"), std::string::npos);
}

// --- parse_decimal --------------------------------------------------------------------------

TEST(Decimal, ErrorsNameTheFieldAndQuoteTheText) {
  // Breaks: an error reply does not say which field of the advertisement was wrong.
  EXPECT_EQ(error_of(parse_decimal("12a", "rkey")), "rkey \"12a\" is not a decimal number");
  EXPECT_EQ(error_of(parse_decimal("", "length")), "length is empty");
}

TEST(Decimal, ExactlyTheLargestU64IsAccepted) {
  // Breaks: a key or virtual address in the top of the 64-bit range is refused.
  auto value = parse_decimal("18446744073709551615", "rkey");
  ASSERT_TRUE(value) << value.error().describe();
  EXPECT_EQ(*value, std::numeric_limits<std::uint64_t>::max());
}

TEST(Decimal, OneMoreThanTheLargestU64IsAnError) {
  // Breaks: an overflowing key wraps around and the RMA targets the wrong key.
  EXPECT_NE(error_of(parse_decimal("18446744073709551616", "rkey")).find("64 bits"),
            std::string::npos);
  EXPECT_FALSE(parse_decimal("99999999999999999999", "rkey"));
  EXPECT_FALSE(parse_decimal("184467440737095516150", "rkey"));
}

TEST(Decimal, SignsAndWhitespaceAreRefusedAsNotDecimal) {
  // Breaks: a key has several spellings (" 1", "+1", "1\n"), or "-1" wraps to the largest key,
  // because the parser skips what std::from_chars refuses.
  for (const char* text : {"+1", "-1", " 1", "1 ", "\t1", "1\n", "0x10", "1e3", "1.0", "1_000"}) {
    const std::string message = error_of(parse_decimal(text, "rkey"));
    EXPECT_NE(message.find("is not a decimal number"), std::string::npos) << message;
  }
}

TEST(Decimal, AnOverflowIsReportedEvenWithJunkAfterTheDigits) {
  // Breaks: "99999999999999999999x" is reported as not decimal, hiding that the digits alone
  // already overflow (the message the tests and operators rely on).
  EXPECT_EQ(error_of(parse_decimal("99999999999999999999x", "len")),
            "len \"99999999999999999999x\" does not fit in 64 bits");
  EXPECT_EQ(error_of(parse_decimal("1x99999999999999999999", "len")),
            "len \"1x99999999999999999999\" is not a decimal number");
}

TEST(Decimal, LeadingZerosAreStillDecimal) {
  // Breaks: a zero-padded key is read as octal or refused.
  auto value = parse_decimal("00010", "rkey");
  ASSERT_TRUE(value);
  EXPECT_EQ(*value, 10u);
}

TEST(Decimal, ControlCharactersInTheTextAreEscapedInTheError) {
  // Breaks: a hostile field with CR/LF splits the RESP error reply carrying the message.
  const std::string message = error_of(parse_decimal("1\r\n-ERR", "rkey"));
  EXPECT_EQ(message.find('\r'), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("\\x0d\\x0a"), std::string::npos) << message;
}

TEST(Decimal, AVeryLongFieldIsClippedInTheError) {
  // Breaks: a megabyte-long field is copied whole into the log line and the reply.
  const std::string message = error_of(parse_decimal(std::string(100000, 'x'), "rkey"));
  EXPECT_LT(message.size(), 200u) << message;
}

// --- escaping outside text ------------------------------------------------------------------

TEST(EscapeForLog, PrintableAsciiPassesThroughUnchanged) {
  // Breaks: ordinary names and numbers in error messages become unreadable.
  EXPECT_EQ(escape_for_log("max-in-flight 64 ~!@#$%^&*()'"), "max-in-flight 64 ~!@#$%^&*()'");
  EXPECT_EQ(escape_for_log(""), "");
}

TEST(EscapeForLog, ControlBytesAreEscapedSoNoMessageCanSplitALine) {
  // Breaks: a CR/LF from an advertisement, key or module argument splits the RESP error reply
  // or forges a line in the server's log.
  EXPECT_EQ(escape_for_log("a\r\nb"), "a\\x0d\\x0ab");
  EXPECT_EQ(escape_for_log(std::string_view("\0\x1f\x7f", 3)), "\\x00\\x1f\\x7f");
}

TEST(EscapeForLog, NonAsciiBytesAreEscapedOneByOne) {
  // Breaks: invalid UTF-8 or terminal escape sequences reach log viewers as raw bytes.
  EXPECT_EQ(escape_for_log("\xc3\xa9\xff"), "\\xc3\\xa9\\xff");
}

TEST(EscapeForLog, QuotesAndBackslashesAreEscapedSoTheEscapingIsUnambiguous) {
  // Breaks: an input spelling "\x0a" literally, or a '"' closing the quote early, reads the same
  // as a different input in the message.
  EXPECT_EQ(escape_for_log("\\x0a\""), "\\x5cx0a\\x22");
}

TEST(EscapeForLog, QuotingClipsLongTextAndSaysHowLongItWas) {
  // Breaks: a megabyte-long field is copied whole into the reply, or the clip hides its size.
  EXPECT_EQ(quote_for_log("abc"), "\"abc\"");
  EXPECT_EQ(quote_for_log("abcdef", 3), "\"abc\"... (6 bytes)");
  EXPECT_EQ(quote_for_log("abc", 3), "\"abc\"");
  EXPECT_EQ(quote_for_log("a\nb", 2), "\"a\\x0a\"... (3 bytes)");
}

// --- advertisements -------------------------------------------------------------------------

Advertisement sample() {
  Advertisement advertisement;
  advertisement.address = {0x02, 0x00, 0x1f, 0x90, 0x7f, 0x00, 0x00, 0x01};
  advertisement.key = 42;
  advertisement.remote_address = 140737488355328;
  return advertisement;
}

TEST(Advertisement, TheWireFormRoundTrips) {
  // Breaks: a client's advertisement no longer parses into the buffer it describes.
  const Advertisement advertisement = sample();
  const std::string wire = to_wire(advertisement);
  EXPECT_EQ(wire, "02001f907f000001 42 140737488355328");
  auto parsed = parse_advertisement(wire);
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(*parsed, advertisement);
}

TEST(Advertisement, TheSplitFormParsesLikeTheWireForm) {
  // Breaks: RPC arguments and the one-string form disagree about the same advertisement.
  auto parsed = parse_advertisement("02001F907F000001", "42", "140737488355328");
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(*parsed, sample());
}

TEST(Advertisement, UppercaseHexIsAccepted) {
  // Breaks: a client printing uppercase hex cannot advertise.
  auto parsed = parse_advertisement("02001F907F000001 42 140737488355328");
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(*parsed, sample());
}

TEST(Advertisement, TwoFieldsAreAnError) {
  // Breaks: a truncated advertisement is parsed with a default remote address of 0.
  const std::string message = error_of(parse_advertisement("0a0b 42"));
  EXPECT_NE(message.find("3 fields"), std::string::npos) << message;
  EXPECT_NE(message.find("got 2"), std::string::npos) << message;
}

TEST(Advertisement, FourFieldsAreAnError) {
  // Breaks: trailing junk after an advertisement is silently ignored.
  const std::string message = error_of(parse_advertisement("0a0b 42 0 7"));
  EXPECT_NE(message.find("got 4"), std::string::npos) << message;
  EXPECT_NE(error_of(parse_advertisement("0a0b")).find("got 1"), std::string::npos);
}

TEST(Advertisement, AnEmptyAdvertisementIsAnError) {
  // Breaks: an empty RPC argument is taken for an advertisement.
  EXPECT_FALSE(parse_advertisement(""));
}

TEST(Advertisement, AnOddLengthAddressIsAnError) {
  // Breaks: a truncated address is inserted into the address vector.
  EXPECT_NE(error_of(parse_advertisement("0a0 42 0")).find("odd"), std::string::npos);
}

TEST(Advertisement, ANonHexAddressCharacterIsAnError) {
  // Breaks: a corrupted address is decoded into garbage bytes.
  const std::string message = error_of(parse_advertisement("0a0x 42 0"));
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("offset 3"), std::string::npos) << message;
}

TEST(Advertisement, SignedNumbersAreErrors) {
  // Breaks: "-1" wraps to the largest key, "+1" is accepted in a form that has one spelling.
  EXPECT_NE(error_of(parse_advertisement("0a0b -1 0")).find("rkey \"-1\""), std::string::npos);
  EXPECT_NE(error_of(parse_advertisement("0a0b +1 0")).find("rkey \"+1\""), std::string::npos);
  EXPECT_NE(error_of(parse_advertisement("0a0b 1 -1")).find("remote address \"-1\""),
            std::string::npos);
  EXPECT_FALSE(parse_advertisement("0a0b 1 +1"));
}

TEST(Advertisement, AnOverflowingNumberIsAnError) {
  // Breaks: a key or address past 2^64-1 wraps and the RMA touches the wrong memory.
  EXPECT_FALSE(parse_advertisement("0a0b 18446744073709551616 0"));
  EXPECT_FALSE(parse_advertisement("0a0b 0 18446744073709551616"));
}

TEST(Advertisement, TheLargestU64IsAcceptedInBothNumbers) {
  // Breaks: a virtual address or key at the top of the range cannot be advertised.
  auto parsed = parse_advertisement("0a0b 18446744073709551615 18446744073709551615");
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(parsed->key, std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parsed->remote_address, std::numeric_limits<std::uint64_t>::max());
}

TEST(Advertisement, EmptyFieldsAreErrors) {
  // Breaks: a missing field from RPC arguments is read as address {} or key 0.
  EXPECT_EQ(error_of(parse_advertisement("", "42", "0")), "address is empty");
  EXPECT_EQ(error_of(parse_advertisement("0a0b", "", "0")), "rkey is empty");
  EXPECT_EQ(error_of(parse_advertisement("0a0b", "42", "")), "remote address is empty");
}

TEST(Advertisement, LeadingWhitespaceIsAnError) {
  // Breaks: a padded advertisement is accepted, so the same one has several spellings.
  EXPECT_NE(error_of(parse_advertisement(" 0a0b 42 0")).find("leading"), std::string::npos);
}

TEST(Advertisement, TrailingWhitespaceIsAnError) {
  // Breaks: a trailing newline from a line-oriented client is silently accepted.
  EXPECT_NE(error_of(parse_advertisement("0a0b 42 0 ")).find("trailing"), std::string::npos);
  EXPECT_FALSE(parse_advertisement("0a0b 42 0\n"));
  EXPECT_FALSE(parse_advertisement("0a0b 42 0\r\n"));
}

TEST(Advertisement, ATabBetweenFieldsIsAnError) {
  // Breaks: whitespace other than one space is read as part of a field or as a separator.
  const std::string message = error_of(parse_advertisement("0a0b\t42 0"));
  EXPECT_NE(message.find("\\x09"), std::string::npos) << message;
  EXPECT_NE(message.find("offset 4"), std::string::npos) << message;
}

TEST(Advertisement, ADoubleSpaceIsAnError) {
  // Breaks: an empty field between two spaces shifts the key into the address slot.
  EXPECT_NE(error_of(parse_advertisement("0a0b  42 0")).find("double"), std::string::npos);
  EXPECT_FALSE(parse_advertisement("0a0b 42  0"));
}

TEST(Advertisement, AnAddressLongerThanTheBoundIsAnError) {
  // Breaks: a hostile advertisement hands libfabric an arbitrarily large address.
  const std::string too_long(2 * (kMaxAddressBytes + 1), 'a');
  EXPECT_NE(error_of(parse_advertisement(too_long, "1", "0")).find("at most"),
            std::string::npos);
  EXPECT_FALSE(parse_advertisement(too_long + " 1 0"));
  // Even when it is not hex: the length is checked before anything is decoded.
  EXPECT_FALSE(parse_advertisement(std::string(100000, 'z'), "1", "0"));
}

TEST(Advertisement, AnAddressOfExactlyTheBoundIsAccepted) {
  // Breaks: the largest real addresses (efa's 32 bytes, and headroom above) are refused.
  const std::string longest(2 * kMaxAddressBytes, 'f');
  auto parsed = parse_advertisement(longest, "1", "0");
  ASSERT_TRUE(parsed) << parsed.error().describe();
  EXPECT_EQ(parsed->address.size(), kMaxAddressBytes);
}

// --- Error ----------------------------------------------------------------------------------

TEST(Error, DescribeIsTheKindThenTheMessage) {
  // Breaks: error replies and log lines lose the kind of failure or change their format.
  EXPECT_EQ(Error(ErrorCode::kCorrupted, "crc mismatch").describe(), "corrupted: crc mismatch");
  EXPECT_EQ(Error(ErrorCode::kInvalidArgument, "x").describe(), "invalid argument: x");
}

TEST(Error, EveryCodeHasItsName) {
  // Breaks: some error kind is reported under the wrong name.
  EXPECT_EQ(to_string(ErrorCode::kInvalidArgument), "invalid argument");
  EXPECT_EQ(to_string(ErrorCode::kConfiguration), "configuration");
  EXPECT_EQ(to_string(ErrorCode::kFabric), "fabric");
  EXPECT_EQ(to_string(ErrorCode::kUnreachable), "unreachable");
  EXPECT_EQ(to_string(ErrorCode::kTimedOut), "timed out");
  EXPECT_EQ(to_string(ErrorCode::kWorkerGone), "worker gone");
  EXPECT_EQ(to_string(ErrorCode::kNotFound), "not found");
  EXPECT_EQ(to_string(ErrorCode::kResourceExhausted), "resource exhausted");
  EXPECT_EQ(to_string(ErrorCode::kCorrupted), "corrupted");
}

}  // namespace
}  // namespace dma
