//! Software verbs provider (`softib://`).
