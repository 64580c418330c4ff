"""The store ports and their in-memory and DynamoDB implementations."""
